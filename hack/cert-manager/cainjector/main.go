// cert-manager's cainjector, out of cluster: a controller-runtime manager with the root module's injectors.
// A thin main over upstream cert-manager's own packages (the root module, pinned in ../go.mod): upstream's
// cmd/* modules are not served by the Go module proxy. Built by hack/build-upstream.sh for the test bed only;
// capi-libvirt itself contains no Go.
package main

import (
	"flag"
	"os"

	apiext "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
	apireg "k8s.io/kube-aggregator/pkg/apis/apiregistration/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	_ "github.com/cert-manager/cert-manager/internal/cainjector/feature"
	cmscheme "github.com/cert-manager/cert-manager/pkg/client/clientset/versioned/scheme"
	"github.com/cert-manager/cert-manager/pkg/controller/cainjector"
)

func main() {
	health := flag.String("health-address", "127.0.0.1:0", "healthz/readyz address (0 port: none)")
	klog.InitFlags(nil)
	flag.Parse()
	// --kubeconfig is registered by controller-runtime (imported by the root module's packages)
	kubeconfig := ptrTo(flag.Lookup("kubeconfig").Value.String())
	ctrl.SetLogger(klog.NewKlogr())
	log := ctrl.Log.WithName("cainjector")

	cfg, err := clientcmd.BuildConfigFromFlags("", *kubeconfig)
	if err != nil {
		log.Error(err, "kubeconfig")
		os.Exit(1)
	}
	scheme := runtime.NewScheme()
	for _, add := range []func(*runtime.Scheme) error{clientgoscheme.AddToScheme, apiext.AddToScheme, apireg.AddToScheme, cmscheme.AddToScheme} {
		if err := add(scheme); err != nil {
			panic(err)
		}
	}
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 scheme,
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: *health,
		LeaderElection:         false,
	})
	if err != nil {
		log.Error(err, "manager")
		os.Exit(1)
	}
	ctx := ctrl.SetupSignalHandler()
	if err := cainjector.RegisterAllInjectors(ctx, mgr, cainjector.SetupOptions{
		EnableCertificatesDataSource: true,
		EnabledReconcilersFor: map[string]bool{
			"mutatingwebhookconfiguration":   true,
			"validatingwebhookconfiguration": true,
			"apiservice":                     true,
			"customresourcedefinition":       true,
		},
	}); err != nil {
		log.Error(err, "registering injectors")
		os.Exit(1)
	}
	if err := mgr.Start(ctx); err != nil {
		log.Error(err, "manager stopped")
		os.Exit(1)
	}
}

func ptrTo(s string) *string { return &s }
