"""The one place where logging, tracing and metrics are set up (Powertools, at module scope)."""

from aws_lambda_powertools import Logger, Metrics, Tracer

SERVICE = "eros"

logger = Logger(service=SERVICE)
tracer = Tracer(service=SERVICE)
metrics = Metrics(namespace="Eros", service=SERVICE)
