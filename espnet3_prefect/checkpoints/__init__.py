"""Every checkpoint evaluated: a checkpoint as ``evaluate`` records it (``checkpoint``), the event that
announces one (``events``), the folder watcher that sends it (``poller``), and the trend across them (``trend``)."""
