"""Tests of mcdla.sim."""
