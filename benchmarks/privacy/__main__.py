from benchmarks.privacy import make
from benchmarks.runner import main

main(make)
