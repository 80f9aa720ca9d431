"""Every checkpoint evaluated: a checkpoint as ``evaluate`` records it (``checkpoint``), the event that
announces one (``events``), the folder watcher that sends it (``poller``), the trend across them
(``trend``), and what ``evaluate`` runs for one (``evaluation``)."""
