"""Benchmarks and their tools: each ``bench`` subcommand's module (``relay``, ``resume``,
``leases``, ``worker``, ``calls``, ``open``), the processes they start (``stack``, ``peer``,
``echo``, ``profiling``), the shared kit and spec, and the SVG plots (``svgplot``)."""
