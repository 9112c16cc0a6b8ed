"""Tests of the Helm chart: rendered, linted, validated against the Kubernetes schemas."""
