"""Sensors read the world (sentinel, Prometheus alerts, HTTP gates). A sensor that cannot answer
raises ``SensorError``; the policy turns "unknown" into "blocked" and records why."""
