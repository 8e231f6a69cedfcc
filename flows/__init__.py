"""Prefect flows and deployments: orchestration only. The only package that imports Prefect."""
