"""Where a watch's probes go: the watch log's typed line (``line``) and the sinks that write it (``sinks``)."""
