"""Run one real Scrapy crawl described by a JSON file; write what happened to another.

Usage: ``python run_crawl.py plan.json result.json``

``plan.json`` holds ``settings`` (Scrapy settings), ``requests`` (the
:class:`loopback.PlanSpider` plan) and optionally ``sweep_interval`` (seconds
between the middleware's checks for leaked permits), ``without_robots_parsed``
(true: the middleware reads robots.txt itself, as on a Scrapy without the
``robots_parsed`` signal) and ``otel`` (true: set up the OpenTelemetry SDK's
global meter provider with an in-memory reader). ``result.json`` gets the
final ``stats``, the spider's ``outcomes`` and, with ``otel``, the ``metrics``
collected at the end: ``[name, attributes, value]`` (a histogram's value is
``[count, sum]``).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from loopback import PlanSpider
from scrapy.crawler import CrawlerProcess
from scrapy.settings import default_settings


def _jsonable(value: Any) -> Any:
    if isinstance(value, (str, int, float, bool)) or value is None:
        return value
    return str(value)


def main() -> None:
    plan = json.loads(Path(sys.argv[1]).read_text())
    import throttlekit.adapters.scrapy as adapter

    if "sweep_interval" in plan:
        adapter.SWEEP_INTERVAL = plan["sweep_interval"]
    if plan.get("without_robots_parsed"):
        adapter.ROBOTS_PARSED_SIGNAL = None
    settings = {
        "TWISTED_DNS_RESOLVER": "loopback.LoopbackResolver",
        "TWISTED_REACTOR": "twisted.internet.asyncioreactor.AsyncioSelectorReactor",
        "LOG_LEVEL": "INFO",
        "TELNETCONSOLE_ENABLED": False,
        # Scrapy >= 2.19's remote control would start a web server in each crawl.
        "EXTENSIONS": {"scrapy.extensions.remote_control.RemoteControl": None},
        **plan["settings"],
    }
    if not hasattr(default_settings, "TWISTED_DNS_RESOLVER"):  # Scrapy < 2.14
        settings["DNS_RESOLVER"] = settings.pop("TWISTED_DNS_RESOLVER")
    reader = _global_metric_reader() if plan.get("otel") else None
    process = CrawlerProcess(settings)
    crawler = process.create_crawler(PlanSpider)
    process.crawl(crawler, plan=plan["requests"])
    process.start()
    stats = crawler.stats.get_stats() if crawler.stats else {}
    result = {
        "stats": {key: _jsonable(value) for key, value in stats.items()},
        "outcomes": crawler.spider.outcomes if crawler.spider else [],
    }
    if reader is not None:
        result["metrics"] = _metrics(reader)
    Path(sys.argv[2]).write_text(json.dumps(result))


def _global_metric_reader() -> Any:
    from opentelemetry import metrics
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))
    return reader


def _metrics(reader: Any) -> list[list[Any]]:
    found = []
    for resource in reader.get_metrics_data().resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "value", None)
                    if value is None:
                        value = [point.count, point.sum]
                    found.append([metric.name, dict(point.attributes), value])
    return found


if __name__ == "__main__":
    main()
