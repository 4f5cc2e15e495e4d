// Package mix is how kubegpu learns its workload mix from pods: what a pod
// adds to the mix the kubegpu policy keeps capacity usable for, and the
// mix rebuilt from the pods a cluster holds. kubegpu-scheduler calls it as
// pods come and go and when it starts; `kubegpu explain` calls it with the
// pods it lists, so that both weigh nodes by the same mix.
package mix
