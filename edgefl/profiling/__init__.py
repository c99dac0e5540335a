"""Device resource profiles and the one tier policy of edgefl.

A :class:`DeviceProfile` says what a device is (architecture, CPU model and cores, RAM total and
available, board and accelerator: CUDA via torch, Jetson via ``/etc/nv_tegra_release`` or the
device-tree model, Raspberry Pi via ``/proc/device-tree/model``) and how fast it trains, from a
short measured benchmark::

    profile = profile_device(quick=True)          # a second or two
    json.dumps(profile.to_dict())                 # goes to the server at registration

The tier policy — used by HierarchyFL, the simulator (``--fleet``) and MQTT registration — is
:func:`choose_tier`: the largest tier of a family whose estimated training memory and round time
fit the device's budget::

    tier = choose_tier(profile, spec_template, family_tiers("hierarchy-width"),
                       TierBudget(memory_fraction=0.5, round_seconds=60, samples_per_round=640))

Cost model (estimates, documented so that they can be argued with):

- **FLOPs.** One forward pass of one sample is traced with hooks; every ``Conv2d`` adds
  ``out.numel() * in_channels/groups * kh * kw`` multiply-accumulates (MACs) and every
  ``Linear`` ``out.numel() * in_features``. Training one sample costs ``6 * MACs`` FLOPs
  (forward 2·MACs, backward twice the forward: gradients w.r.t. inputs and weights).
- **Training memory** (:func:`estimate_training_memory_mb`)::

      bytes = P * 4 * (2 + k)  +  B * (A + I)  +  B * 4 * (C + L)

  with P the parameter count (weights and gradients, float32), k the optimizer's state tensors
  per parameter (plain SGD 0, SGD with momentum 1, Adam 2), B the batch size, A the bytes of
  activations autograd saves for the backward pass per sample — *measured* by running a
  forward pass under ``torch.autograd.graph.saved_tensors_hooks`` and summing the distinct
  non-parameter tensors saved — I the input bytes per sample, C the number of classes and L the
  largest single activation (the gradient buffer that is live during backward). Buffers and the
  Python/torch runtime itself are not part of it: that is what ``memory_fraction`` leaves room for.
- **Round time** (:func:`estimate_round_seconds`): ``samples * 6 * MACs / train_gflops`` where
  ``train_gflops`` is the profile's measured *effective* training throughput: the images/s of a
  small reference CNN trained forward+backward, times that CNN's ``6 * MACs``. Large models run
  somewhat more efficiently than the small reference CNN, so the estimate errs on the slow side.

The compute benchmark runs on the CPU (edgefl trains on the CPU); a CUDA device is recorded in
the profile but not benchmarked. Without torch (the base install of a device that only runs
exported models) the profile still detects the device and measures matmul throughput with numpy;
its training fields stay 0 and ``source`` says so. Torch is imported only where it is used.

The modules, along the seams: :mod:`~edgefl.profiling.profile` (:class:`DeviceProfile`),
:mod:`~edgefl.profiling.detection` (what the device is), :mod:`~edgefl.profiling.measurement`
(how fast it trains, what a model costs), :mod:`~edgefl.profiling.tiers` (the tier policy) and
:mod:`~edgefl.profiling.fleet` (reference profiles and fleet files).
"""


from edgefl.profiling.detection import (
    cpu_model,
    detect_kind,
    jetson_release,
    memory_mb,
    read_board,
)
from edgefl.profiling.fleet import (
    Fleet,
    fleet_tiers,
    load_fleet,
    load_profile,
    read_fleet,
)
from edgefl.profiling.measurement import (
    BYTES,
    OPTIMIZER_STATES,
    REFERENCE_BATCH,
    REFERENCE_INPUT,
    ModelCost,
    benchmark_matmul,
    benchmark_training,
    estimate_round_seconds,
    estimate_training_memory_mb,
    model_cost,
    profile_device,
    trace_module,
    training_flops_per_sample,
)
from edgefl.profiling.profile import (
    DeviceProfile,
)
from edgefl.profiling.tiers import (
    TierBudget,
    TierEstimate,
    choose_tier,
    estimate_tiers,
    memory_budget_mb,
)

__all__ = [
    "BYTES",
    "DeviceProfile",
    "Fleet",
    "ModelCost",
    "OPTIMIZER_STATES",
    "REFERENCE_BATCH",
    "REFERENCE_INPUT",
    "TierBudget",
    "TierEstimate",
    "benchmark_matmul",
    "benchmark_training",
    "choose_tier",
    "cpu_model",
    "detect_kind",
    "estimate_round_seconds",
    "estimate_tiers",
    "estimate_training_memory_mb",
    "fleet_tiers",
    "jetson_release",
    "load_fleet",
    "load_profile",
    "memory_budget_mb",
    "memory_mb",
    "model_cost",
    "profile_device",
    "read_board",
    "read_fleet",
    "trace_module",
    "training_flops_per_sample",
]
