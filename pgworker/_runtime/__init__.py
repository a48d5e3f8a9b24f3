"""The worker at run time: the producer claims (claimer), runs (executor) and finishes (completer)
jobs; the heartbeat, notifier, turns and fleet limits serve it; metrics and the health file
observe it."""
