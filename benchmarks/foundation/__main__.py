from benchmarks.foundation import make
from benchmarks.runner import main

main(make)
