"""The `recursa batch` command (recursa.batch.cli). `RLM.batch` and its parts live in
recursa.core.batch."""
