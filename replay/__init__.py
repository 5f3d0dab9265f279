"""The replay core: model/ (specs, memory arithmetic, step model), the engines, fleet/ (cluster
loop, control plane, metrics), outputs/, calibration/, measured/ and cli/."""
