"""The rule book: one TOML file per rule, and the BN API catalogue (data, shipped in the wheel)."""
