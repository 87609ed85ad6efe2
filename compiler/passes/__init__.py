"""The passes of ostinato-compile, one module each; compiler/compile.py runs them in order (its PASSES) and
holds the re-plan loop. Each pass is a function of the Build: it reads what earlier passes put there and
adds its own result; the two that can ask for the placement again (replan, speculation) return why.

Module map:
    options.py         CompileOptions (the command line, parsed), the values its choices take, CompileError
    build.py           Build: the state the passes share
    read_model.py      read_model: config, fingerprints, MTP block; the model-bound options checked
    read_profile.py    read_profile: the routing profile (recorded, synthetic or uniform)
    read_hardware.py   read_hardware: the hardware spec
    read_workloads.py  read_workloads: the workloads the choices are priced on, the idle period they record
    memory.py          memory: what each layer and GPU holds whatever the placement
    placement.py       placement: hot experts and the layer split, fitted to memory (gives up what it may)
    cost_model.py      cost_model: the placement priced; the split-route / upload-once threshold
    shard_copy.py      shard_copy: whether the host holds the down matrices shard-major for sharded uploads
    buckets.py         buckets: the prefill buckets
    replan.py          replan: the graph-pool reserve back to the buckets kept
    speculation.py     speculation: whether the plan decodes with the MTP block
    policy.py          policy: the execution policy, validated by the schema
    kernels.py         kernels: the kernels the plan needs, built
    plan.py            plan: the plan written out (notes, provenance, memory rows, layers)
  and what the passes share:
    least_wait.py      a choice priced on the workloads (the threshold, the buckets)
    footprint.py       what each device holds under a placement (the placement's host check, the memory rows)
    predictions.py     the plan's predictions, at the headline session position
"""
