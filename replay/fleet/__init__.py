"""A fleet of engines over time: the cluster loop that plans the pools and steps the engine tick
by tick (cluster), the control plane between ticks (control: replica lifecycle, scrapes,
autoscaling), the run's frames and summary (metrics), whether each pool kept up (saturation) and
the live run directory a replay writes while it runs (live)."""
