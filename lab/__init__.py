"""The kernel lab: a real IPVS-capable Linux kernel (User-Mode Linux) for ipvsproxy's tests.

The host kernel that develops and tests ipvsproxy has no IPVS and no dummy device, so every
dataplane claim is proven inside a UML guest that boots with the host filesystem as its root.
Not shipped in the wheel.
"""
