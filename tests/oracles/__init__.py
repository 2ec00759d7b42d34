"""Straightforward reference implementations that the tests compare the product code with."""
