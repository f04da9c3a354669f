"""pytest setup for seqpar's Python tests: the reference module sits beside the tests."""
import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
