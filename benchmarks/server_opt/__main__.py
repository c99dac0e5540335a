from benchmarks.runner import main
from benchmarks.server_opt import make

main(make)
