"""`warden canary`: repeated greedy completions through the real endpoint, checked for determinism and against a
reference run (the seeds' json and color canaries: "json 96/96 + color 96/96 vs no-spec")."""
