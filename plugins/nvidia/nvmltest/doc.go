// Package nvmltest builds mock NVML machines for tests of the NVIDIA device
// module, in the style of NVIDIA's k8s-device-plugin test helpers: readable
// builders over go-nvml's mock machines.
//
//	m := nvmltest.NewDGXA100().WithMIG(0, "3g.20gb", "2g.10gb", "1g.5gb")
//	m := nvmltest.NewDGX1()                    // V100s in the hybrid cube-mesh
//	m := nvmltest.NewDGXA100().WithoutNVLink() // PCIe only
//	m.InjectXID(3, 79)                         // GPU 3 fell off the bus
//
// go-nvml's dgxa100 mock has UUIDs, names, memory and MIG profiles but no
// PCI bus IDs, NUMA nodes, topology, NVLinks, MIG device handles or events
// (those methods panic); Machine fills them in. A Machine is an
// nvml.Interface; its event sets are safe for concurrent use.
package nvmltest
