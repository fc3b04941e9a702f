// cert-manager's controller, out of cluster: the controllers registered by the root module's packages,
// run against --kubeconfig, without leader election.
// A thin main over upstream cert-manager's own packages (the root module, pinned in ../go.mod): upstream's
// cmd/* modules are not served by the Go module proxy. Built by hack/build-upstream.sh for the test bed only;
// capi-libvirt itself contains no Go.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/klog/v2"

	"github.com/cert-manager/cert-manager/pkg/controller"
	logf "github.com/cert-manager/cert-manager/pkg/logs"

	_ "github.com/cert-manager/cert-manager/internal/controller/feature"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/approver"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/ca"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificaterequests/selfsigned"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/issuing"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/keymanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/metrics"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/readiness"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/requestmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/revisionmanager"
	_ "github.com/cert-manager/cert-manager/pkg/controller/certificates/trigger"
	_ "github.com/cert-manager/cert-manager/pkg/controller/clusterissuers"
	_ "github.com/cert-manager/cert-manager/pkg/controller/issuers"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/ca"
	_ "github.com/cert-manager/cert-manager/pkg/issuer/selfsigned"
)

func main() {
	kubeconfig := flag.String("kubeconfig", "", "kubeconfig of the API server")
	clusterResourceNamespace := flag.String("cluster-resource-namespace", "cert-manager", "namespace of ClusterIssuers' secrets")
	klog.InitFlags(nil)
	flag.Parse()

	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx = logf.NewContext(ctx, logf.Log, "controller")
	log := logf.FromContext(ctx)

	factory, err := controller.NewContextFactory(ctx, controller.ContextOptions{
		Kubeconfig:         *kubeconfig,
		KubernetesAPIQPS:   20,
		KubernetesAPIBurst: 50,
		IssuerOptions:      controller.IssuerOptions{ClusterResourceNamespace: *clusterResourceNamespace},
		ACMEOptions: controller.ACMEOptions{
			HTTP01SolverResourceRequestCPU:    resource.MustParse("10m"),
			HTTP01SolverResourceRequestMemory: resource.MustParse("64Mi"),
			HTTP01SolverResourceLimitsCPU:     resource.MustParse("100m"),
			HTTP01SolverResourceLimitsMemory:  resource.MustParse("64Mi"),
		},
		CertificateOptions: controller.CertificateOptions{CertificateRequestMinimumBackoffDuration: time.Hour},
		SchedulerOptions:   controller.SchedulerOptions{MaxConcurrentChallenges: 60},
	})
	if err != nil {
		log.Error(err, "building the controller context")
		os.Exit(1)
	}
	var names []string
	for name, construct := range controller.Known() {
		iface, err := construct(factory)
		if err != nil {
			log.Error(err, "constructing controller", "controller", name)
			os.Exit(1)
		}
		names = append(names, name)
		go func(name string, iface controller.Interface) {
			if err := iface.Run(5, ctx); err != nil {
				log.Error(err, "controller failed", "controller", name)
				os.Exit(1)
			}
		}(name, iface)
	}
	built, err := factory.Build()
	if err != nil {
		log.Error(err, "building context")
		os.Exit(1)
	}
	built.SharedInformerFactory.Start(ctx.Done())
	built.KubeSharedInformerFactory.Start(ctx.Done())
	built.HTTP01ResourceMetadataInformersFactory.Start(ctx.Done())
	log.Info("controllers started", "controllers", strings.Join(names, ","))
	<-ctx.Done()
	log.Info("stopping")
}
