"""The DTMF demo recipe (synthetic data + a small real torch model, no downloads): `dtmf` makes the
corpus, `decoder` is the model, `recipe` the ESPnet3-style organizer/recognizer/output_fn, `feats` and
`stats` a feature-extraction workload. Installed by scripts/setup.sh (`pip install -e recipes/dtmf`)."""
