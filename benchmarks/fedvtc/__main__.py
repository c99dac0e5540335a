from benchmarks.fedvtc import make
from benchmarks.runner import main

main(make)
