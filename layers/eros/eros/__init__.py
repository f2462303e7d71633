"""eros: the shared package of the dreaming-memory engine (a Lambda layer; also the local stack and the tests)."""
