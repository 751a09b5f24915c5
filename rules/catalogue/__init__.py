"""The BN API catalogue: which qualified names are BatchNorm APIs, as data."""
