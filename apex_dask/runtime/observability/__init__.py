"""Seeing a run: metrics transport and store, the ``/apex`` page, JSON and Prometheus.

- :mod:`.metrics`: ``MetricsPublisher`` (actors -> scheduler event log) and
  the scheduler plugin that keeps the series;
- :mod:`.metrics_store`: bounded time series per metric name;
- :mod:`.dashboard`: the Bokeh page;
- :mod:`.http`: ``/apex/metrics.json`` and Prometheus gauges;
- :mod:`.preload`: the scheduler preload that installs all of it.
"""
