"""Operators' views of KIP-848 groups of any client: see `consumer_sdk.admin.groups`."""
