from benchmarks.fedhenn import make
from benchmarks.runner import main

main(make)
