module github.com/kubegpu/kubegpu/hack/dashboard

go 1.26.0

require github.com/grafana/grafana-foundation-sdk/go v0.0.18
