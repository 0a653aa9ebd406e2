"""The matrix-unit shapes and types each Vulkan device offers through VK_KHR_cooperative_matrix and
NVIDIA's older VK_NV_cooperative_matrix: (M, N, K, the types of A, B, C and the result, scope), as
the driver lists them. What an error-compensated product (each float32 operand split into parts of
a narrower type, several products added in float32) could be built from on that device. (The
shaders would be compiled by glslc: Debian 12's, shaderc 2023.2, knows GL_NV_cooperative_matrix but
not yet GL_KHR_cooperative_matrix.)

    python benchmarks/vk_coopmat.py [--json out.json]

A device without an extension is listed as such. Component types the `vulkan` binding has no
name for (newer than it: bfloat16, the 8-bit floats) are printed as their numbers.
"""

from __future__ import annotations

import argparse
import json
import sys

import vulkan as vk

from ssm_vk.runtime import device

EXTS = {"VK_KHR_cooperative_matrix": "KHR", "VK_NV_cooperative_matrix": "NV"}


def _names(prefix: str) -> dict:
    return {getattr(vk, n): n[len(prefix):] for n in dir(vk)
            if n.startswith(prefix) and n.endswith("_KHR") and "RANGE" not in n and "MAX_ENUM" not in n}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--json", default=None)
    args = ap.parse_args(argv)
    types = _names("VK_COMPONENT_TYPE_")
    scopes = _names("VK_SCOPE_")
    app = vk.VkApplicationInfo(pApplicationName="vk_coopmat", apiVersion=vk.VK_MAKE_VERSION(1, 1, 0))
    instance = vk.vkCreateInstance(vk.VkInstanceCreateInfo(pApplicationInfo=app), None)
    out = []
    try:
        for phys in vk.vkEnumeratePhysicalDevices(instance):
            name = vk.vkGetPhysicalDeviceProperties(phys).deviceName
            exts = {e.extensionName for e in vk.vkEnumerateDeviceExtensionProperties(phys, None)}
            for ext, suffix in EXTS.items():
                row = {"device": name, "extension": ext, "offered": ext in exts, "shapes": []}
                if ext in exts:
                    for m, n, k, at, bt, ct, rt_, scope in device.matrix_shapes(instance, phys, suffix):
                        row["shapes"].append({"M": m, "N": n, "K": k, "A": types.get(at, str(at)),
                                              "B": types.get(bt, str(bt)), "C": types.get(ct, str(ct)),
                                              "result": types.get(rt_, str(rt_)),
                                              "scope": scopes.get(scope, str(scope))})
                out.append(row)
                print(f"{name}, {ext}: " + (f"{len(row['shapes'])} shapes" if row["offered"] else "not offered"))
                for s in row["shapes"]:
                    print(f"  {s['M']}x{s['N']}x{s['K']}  A {s['A']}  B {s['B']}  C {s['C']}  result {s['result']}"
                          f"  scope {s['scope']}")
    finally:
        vk.vkDestroyInstance(instance, None)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
