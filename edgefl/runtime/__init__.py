"""Runtime: the run assembly (``setup``), the round loop (``loop``), the device agent (``agent``),
the in-memory simulation (``simulation``), the MQTT server (``server``) and device (``device``).

Import names from their module: this package imports nothing, so that the device's registration
(``edgefl device register``) runs on the base install, without the torch that the agent and the
loop need.
"""
