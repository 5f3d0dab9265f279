"""What a run leaves behind: its files and columns declared once (schema), the run directory
written atomically (write), its writer's safety (rundir: one writer per --out, signals, the
swap), the verdict lines of a run that went wrong (verdict) and the terminal tables of the CLI
(report)."""
