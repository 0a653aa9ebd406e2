"""The ``ssm-scan`` command: the front door to the three backends."""
