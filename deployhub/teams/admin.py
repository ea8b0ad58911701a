from django.contrib import admin

from deployhub.teams.models import (
    Event,
    Membership,
    SignInFailures,
    Team,
    TokenFailures,
    Webhook,
    WebhookDelivery,
)


class MembershipInline(admin.TabularInline):
    model = Membership
    extra = 0


@admin.register(Team)
class TeamAdmin(admin.ModelAdmin):
    list_display = ["name", "slug", "created_at"]
    prepopulated_fields = {"slug": ["name"]}
    inlines = [MembershipInline]


@admin.register(Event)
class EventAdmin(admin.ModelAdmin):
    """The audit log is read-only, here as everywhere."""

    list_display = ["created_at", "team", "actor", "verb", "target_type", "target_id"]
    list_filter = ["team", "verb"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(Webhook)
class WebhookAdmin(admin.ModelAdmin):
    """The secret stays off this page; an admin reads it once, on the team settings page."""

    list_display = ["url", "team", "events", "active", "created_by", "created_at"]
    list_filter = ["team", "active"]


@admin.register(WebhookDelivery)
class WebhookDeliveryAdmin(admin.ModelAdmin):
    """Deliveries are what happened: read-only."""

    list_display = ["created_at", "webhook", "event", "attempt", "state", "status_code"]
    list_filter = ["state", "webhook__team"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


@admin.register(TokenFailures)
class TokenFailuresAdmin(admin.ModelAdmin):
    """Addresses that presented made-up tokens; delete a row to lift its lockout early."""

    list_display = ["address", "failures", "window_started_at", "locked_until"]
    ordering = ["-window_started_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False


@admin.register(SignInFailures)
class SignInFailuresAdmin(admin.ModelAdmin):
    """Failed sign-ins per username and address (username empty: per address); delete a row
    to lift its lockout early."""

    list_display = ["username", "address", "failures", "window_started_at", "locked_until"]
    search_fields = ["username", "address"]
    ordering = ["-window_started_at"]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False
