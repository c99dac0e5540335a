from benchmarks.feddw import make
from benchmarks.runner import main

main(make)
