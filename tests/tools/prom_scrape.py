#!/usr/bin/env python3
"""Scrapes a Prometheus endpoint and parses it with prometheus_client's own text
parser (the reference implementation), printing the samples as JSON:
{"status": HTTP status, "samples": [[name, {labels}, value], ...]}."""
import json
import sys
import urllib.error
import urllib.request

from prometheus_client.parser import text_string_to_metric_families


def main():
    url = sys.argv[1]
    try:
        with urllib.request.urlopen(url, timeout=5) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        print(json.dumps({"status": e.code, "samples": []}))
        return 0
    samples = []
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            samples.append([s.name, s.labels, s.value])
    print(json.dumps({"status": status, "samples": samples}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
