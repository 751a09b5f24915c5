"""`bnfix server`: a Language Server (LSP over stdio) that reports bnfix's findings in open
documents and offers their fixes and `# noqa` comments as code actions.

analysis.py  the open documents through the project pass (their texts stand in for the files)
actions.py   the edits of the code actions (a fix that still parses, a `# noqa` comment)
positions.py bnfix's rows and character columns <-> LSP lines and client code units
server.py    the pygls server: document sync, debounced analysis, diagnostics, code actions
"""
