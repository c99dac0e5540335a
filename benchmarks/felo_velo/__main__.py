from benchmarks.felo_velo import make
from benchmarks.runner import main

main(make)
