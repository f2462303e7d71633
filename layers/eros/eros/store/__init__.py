"""Data access: every SQL statement of the engine lives in these modules (and in migrations/)."""
