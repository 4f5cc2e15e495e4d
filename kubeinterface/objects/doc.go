// Package objects reads and writes kubegpu's data on Pod and Node objects:
// what a pod asks for (its containers' limits and its kubegpu.io
// annotations), a pod's allocation annotation and a node's inventory
// annotation. It is apart from package kubeinterface, which holds the keys,
// payloads and signatures, so that the node agent, which needs only those,
// does not link the whole core API.
package objects
