"""What a replica is made of and how long its steps take: the model and GPU catalog (specs,
models, gpus; hf/ reads a Hugging Face config.json), memory arithmetic (weights, KV capacity),
the roofline step model and the terms it is built from (stepmodel, stepterms), and the serving
terms outside the engine's steps (serving)."""
