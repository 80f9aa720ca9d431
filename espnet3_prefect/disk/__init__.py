"""The ground floor: what a run leaves on disk, named and read in one place. ``layout`` (every file
name of a stage), ``marker`` (``split.N/done``, the one truth for "this shard is done"), ``concat``
(the streamed, atomic concatenation of shard files) and ``client_file`` (the 0600 file that hands a
Prefect API's URL and credential to every client). Imports nothing of ours but ``errors`` and
``_internal``; everything above reads the disk through it."""
