"""The step model fitted to measurements: step times (data reads the CSVs, steps fits and
cross-validates), whole real-vLLM experiments (requests), Vidur's kernel profiles (vidur, which
wrote the shipped defaults), the profile files a config's `step_model: {profile: ...}` reads
(profiles; the shipped ones are in replay/profiles/) and the kernel timer behind `llm-replay
profile` (profiler). Their commands are replay/cli/calibrate.py and replay/cli/profile.py."""
