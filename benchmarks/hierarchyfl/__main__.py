from benchmarks.hierarchyfl import make
from benchmarks.runner import main

main(make)
