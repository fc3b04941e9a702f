// cert-manager's webhook, out of cluster: the root module's webhook server, configured with a
// WebhookConfiguration file (webhook.config.cert-manager.io/v1alpha1) as the upstream binary's --config.
// A thin main over upstream cert-manager's own packages (the root module, pinned in ../go.mod): upstream's
// cmd/* modules are not served by the Go module proxy. Built by hack/build-upstream.sh for the test bed only;
// capi-libvirt itself contains no Go.
package main

import (
	"context"
	"flag"
	"os"
	"os/signal"
	"syscall"

	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"

	config "github.com/cert-manager/cert-manager/internal/apis/config/webhook"
	webhookscheme "github.com/cert-manager/cert-manager/internal/apis/config/webhook/scheme"
	cmwebhook "github.com/cert-manager/cert-manager/internal/webhook"
	_ "github.com/cert-manager/cert-manager/internal/webhook/feature"
	logf "github.com/cert-manager/cert-manager/pkg/logs"
)

const empty = "apiVersion: webhook.config.cert-manager.io/v1alpha1\nkind: WebhookConfiguration\n"

func main() {
	configFile := flag.String("config", "", "a WebhookConfiguration file (defaults apply to what it leaves out)")
	klog.InitFlags(nil)
	flag.Parse()
	// --kubeconfig is registered by controller-runtime (imported by the root module's packages)
	kubeconfig := ptrTo(flag.Lookup("kubeconfig").Value.String())
	log := logf.Log.WithName("webhook")

	data := []byte(empty)
	if *configFile != "" {
		var err error
		if data, err = os.ReadFile(*configFile); err != nil {
			log.Error(err, "reading config")
			os.Exit(1)
		}
	}
	_, codecs, err := webhookscheme.NewSchemeAndCodecs()
	if err != nil {
		panic(err)
	}
	cfg := &config.WebhookConfiguration{}
	if err := runtime.DecodeInto(codecs.UniversalDecoder(), data, cfg); err != nil {
		log.Error(err, "decoding config")
		os.Exit(1)
	}
	if *kubeconfig != "" {
		cfg.KubeConfig = *kubeconfig
	}
	srv, err := cmwebhook.NewCertManagerWebhookServer(log, *cfg)
	if err != nil {
		log.Error(err, "building the webhook server")
		os.Exit(1)
	}
	ctx, cancel := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer cancel()
	ctx = logf.NewContext(ctx, log)
	if err := srv.Run(ctx); err != nil {
		log.Error(err, "webhook server")
		os.Exit(1)
	}
}

func ptrTo(s string) *string { return &s }
