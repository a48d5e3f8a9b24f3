"""Recipes from the README, each kept true by tests/test_recipes.py."""
