"""PySpark integration: a KIP-848 group-member streaming source and executor members."""
