"""Local mode: the distributed system on one machine, each service its own process on loopback.

The children are started with the same `apexrl <service>` entry points the containers use,
configured by one TOML file in the run folder (as a ConfigMap would), on ports they pick
themselves (port 0, reported through ready files). Progress comes from their Prometheus
endpoints, the same numbers the dashboards show.

- settings.py: local mode's settings and the one config file every child reads;
- supervision.py: the child processes, started and stopped in dependency order;
- monitoring.py: each row of metrics.csv, scraped from the children's /metrics;
- run.py: `apexrl local` itself, from the command line to the outputs.
"""
