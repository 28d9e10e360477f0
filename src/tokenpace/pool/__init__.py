"""The serverless pool: containers with a cold/loading/warm life cycle, checkpoint tiers and
caches, routers, autoscaling and live migration, simulated in virtual time."""
