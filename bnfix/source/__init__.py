"""The static Python-source front-end: read, parse (CPython ast), lift into the IR, write fixes."""
