"""What the gateway tells operators about itself: Prometheus metrics (`metrics.py`)."""
