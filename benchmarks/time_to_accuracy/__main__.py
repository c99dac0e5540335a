from benchmarks.runner import main
from benchmarks.time_to_accuracy import make

main(make)
