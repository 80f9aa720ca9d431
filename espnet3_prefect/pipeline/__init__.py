"""The data path of a stage, one module per step, in the order a run takes them:

``stage`` (config -> validated test sets) -> ``sizing`` (the test set sized on the driver) -> ``plan``
(shards) -> ``resume`` (which shards run again) -> ``env`` (build env per worker) -> ``shard`` (run shard)
-> ``disk.marker`` (mark done) -> ``merge`` -> ``summary`` (the typed result) -> ``report`` (progress, tables).
``driver`` runs those steps for one stage on a task runner; ``in_process`` runs them in this process.
The driver-side checks before a server starts: ``precheck``; on-disk names and the done marker are the
ground floor's (:mod:`espnet3_prefect.disk`); one run per folder: ``lock``; ``prefetch`` reads ahead inside a shard;
``runner_job`` prepares any ESPnet3 runner over an index list; ``dataprep`` makes a recipe's data."""
