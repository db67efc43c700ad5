"""Tests of the Helm chart: rendered by a real helm, checked offline."""
